include:
  - makina-states.cloud.lxc.compute_node.grains
  - makina-states.cloud.lxc.compute_node.install_lxc
  - makina-states.cloud.lxc.compute_node.images
