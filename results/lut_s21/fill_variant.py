"""Writes the Gluon FP4 module with the ring's fill clamping every chunk (session 21 call 7's form, which made
the BM32 resident kernel 4.5% faster and the ring pick 1.5% slower at down 6144) to the path given, from the
shipped module: the A/B of results/lut_s21/next_session.sh.

    python results/lut_s21/fill_variant.py /root/fp4_wgmma_fill_all.py
"""

import sys
from pathlib import Path

SHIPPED = '''        kc = i
        live = fresh
        if i >= 2:
            kc = gl.minimum(i, num_k - 1)
            live = fresh & (i < num_k)
'''
CLAMP_ALL = '''        kc = gl.minimum(i, num_k - 1)
        live = fresh & (i < num_k)
'''
src = Path("moetune/kernels/fp4_wgmma.py").read_text()
assert src.count(SHIPPED) == 1, "the fill changed: update this variant"
Path(sys.argv[1]).write_text(src.replace(SHIPPED, CLAMP_ALL))
