mccloud-compute-node-grain:
  grains.present:
    - failhard: true
    - name: makina-states.cloud.is.compute_node
    - value: true
