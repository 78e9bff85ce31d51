{#- Historical name (makina-states): the node's hosts entries for its VMs'
    domains, now makina-states.cloud.generic.compute_node.hosts. Data: as
    hosts. #}
include:
  - makina-states.cloud.generic.compute_node.hosts
