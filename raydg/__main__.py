from raydg.cli import main

main()
