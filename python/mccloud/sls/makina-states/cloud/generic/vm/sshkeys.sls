{#- Historical name (makina-states): the controller's public key in root's authorized_keys in the VM,
    written today from the compute node into the VM's root filesystem by
    makina-states.cloud.generic.vm.preprovision. Data: as preprovision. #}
include:
  - makina-states.cloud.generic.vm.preprovision
