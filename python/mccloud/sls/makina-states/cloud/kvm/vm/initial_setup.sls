{#- Initial setup: the VM's seed (root's password HASH from the registry,
    its network, the files the other steps placed in seed-root, and the
    minion's files when the job bootstraps it) packed into its seed ISO,
    then its first boot (see start.sls). Data: as start. #}
include:
  - makina-states.cloud.kvm.vm.start
