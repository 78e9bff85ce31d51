{#- Controller side of the lxc driver: the driver marker. #}
mccloud-lxc-controller-grain:
  grains.present:
    - name: makina-states.cloud.lxc.controller
    - value: true
