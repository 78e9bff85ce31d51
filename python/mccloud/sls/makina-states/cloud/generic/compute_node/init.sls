include:
  - makina-states.cloud.generic.compute_node.registry
  - makina-states.cloud.generic.compute_node.grains
  - makina-states.cloud.generic.compute_node.ports
  - makina-states.cloud.generic.compute_node.reverse_proxy
  - makina-states.cloud.generic.compute_node.firewall
  - makina-states.cloud.generic.compute_node.hosts
