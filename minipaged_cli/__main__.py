from minipaged_cli.cli import main

main()
