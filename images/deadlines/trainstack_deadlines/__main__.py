import sys

from trainstack_deadlines.cli import main

sys.exit(main())
