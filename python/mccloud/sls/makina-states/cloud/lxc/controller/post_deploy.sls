{#- Controller side of the lxc driver: the driver marker and the nightly
    image synchronisation (crons.sls). Data: pillar mccloud:image_sync. #}
include:
  - makina-states.cloud.lxc.controller.crons

mccloud-lxc-controller-grain:
  grains.present:
    - name: makina-states.cloud.lxc.controller
    - value: true
