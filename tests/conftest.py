from tests.simfixtures import *  # noqa: F403  (fake NVML library + scenario fixtures)
