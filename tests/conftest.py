from tests.simfixtures import *  # noqa: F403  (fake NVML library + scenario fixtures)
from tests.slurmfixtures import *  # noqa: F403  (the real Slurm mini-cluster)
