"""python -m tiered.cli"""

from tiered.cli import main

main()
