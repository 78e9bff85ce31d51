{#- Reconfigure: apply changed settings to an existing container; it is
    restarted when its configuration changed (see config.sls). #}
include:
  - makina-states.cloud.lxc.vm.config
