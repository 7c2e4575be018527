from niah.cli import main

main()
