from llm_sandbox_mcp.cli import main

raise SystemExit(main())
