mccloud-compute-node-grain:
  grains.present:
    - name: makina-states.cloud.is.compute_node
    - value: true
