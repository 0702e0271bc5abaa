import sys

from trainstack_prewarm.cli import main

sys.exit(main())
