{#- Historical name (makina-states): the lxc VM grains, written today from
    the compute node into the container by
    makina-states.cloud.lxc.vm.preprovision. Data: as preprovision. #}
include:
  - makina-states.cloud.lxc.vm.preprovision
