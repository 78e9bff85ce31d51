{#- kvm on a compute node: grains and the kvm install (images are built on
    the controller, see images.sls, and synchronised by mc_cloud_kvm.sync_images). #}
include:
  - makina-states.cloud.kvm.compute_node.grains
  - makina-states.cloud.kvm.compute_node.install_kvm
