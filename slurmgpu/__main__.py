from slurmgpu.cli import main

main()
