from minipaged_cli.cli.main import main

main()
