{#- Historical name (makina-states): the lxc cloud part, included by
    makina-states' cloud autoinclude where it is active. It registered
    itself as active (the grain below, read by mc_cloud.registry()) and
    included the generic part. The lxc controller side is applied by
    mc_cloud_lxc.post_deploy_controller (makina-states.cloud.lxc.controller). #}
include:
  - makina-states.cloud.generic

mccloud-cloud-lxc-active:
  grains.present:
    - name: makina-states.cloud.lxc
    - value: true
