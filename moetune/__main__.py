from moetune.cli import main

main()
