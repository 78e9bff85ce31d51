{#- Historical name (makina-states): the markers /this_host and /this_port in the VM,
    written today from the compute node into the VM's root filesystem by
    makina-states.cloud.generic.vm.preprovision. Data: as preprovision. #}
include:
  - makina-states.cloud.generic.vm.preprovision
