{#- Historical name (makina-states): the generic cloud part, included by
    makina-states' cloud autoinclude where it is active. It registered
    itself as active: the grain below is what mc_cloud.registry() reads.
    The controller itself is deployed by mc_cloud_controller.deploy
    (makina-states.cloud.generic.controller). #}
mccloud-cloud-generic-active:
  grains.present:
    - name: makina-states.cloud.generic
    - value: true
