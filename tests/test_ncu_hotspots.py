"""tools/ncu_hotspots.py: the stall samples of an ncu source page, per instruction and address range."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from ncu_hotspots import range_totals, read  # noqa: E402

HEAD = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
        '"# Samples","Instructions Executed"')
CSV = "==PROF== Connected to process 1\n" + HEAD + '''
"0x7f0000001000","USETMAXREG.DEALLOC.CTAPOOL 0x18","1","1","1","4"
"0x7f0000001010","LDS R10, [R117+0x26400]","30","20","30","128"
"0x7f0000001020","USETMAXREG.DEALLOC.CTAPOOL 0xc0","2","2","2","8"
"0x7f0000001030","@!P0 BRA 0x7f0000001030","500","400","500","1024"
"0x7f0000001040","QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR12], RZ, !UPT","7","3","7","1024"
'''


def test_reads_past_ncu_lines_and_totals_ranges_from_the_kernel_start(tmp_path):
    path = tmp_path / "src.csv"
    path.write_text(CSV)
    frame = read(str(path))
    assert len(frame) == 5 and frame.addr.min() == 0x7F0000001000
    assert range_totals(frame, ["0x0-0x1f", "0x20-0x40", "0x50-0x90"]) == [
        ("0x0-0x1f", 31, 2), ("0x20-0x40", 509, 3), ("0x50-0x90", 0, 0)]
    assert range_totals(frame, ["0x7f0000001030-0x7f0000001030"], relative=False) == [
        ("0x7f0000001030-0x7f0000001030", 500, 1)]
