{#- Historical name (makina-states): the saltify cloud part, included by
    makina-states' cloud autoinclude where it is active. It registered
    itself as active (the grain below, read by mc_cloud.registry()) and
    wrote salt-cloud's saltify provider and profile: mccloud has no
    equivalent of those, its saltify driver is the mc_cloud_saltify.saltify
    runner. #}
mccloud-cloud-saltify-active:
  grains.present:
    - name: makina-states.cloud.saltify
    - value: true
