from scalefit.cli import main

raise SystemExit(main())
