{#- Historical name (makina-states): it authorised the controller's root
    keys on the compute node. mccloud has no equivalent: it reaches compute
    nodes as minions of its master, and the controller's key
    (makina-states.cloud.controller.ssh_key, used by mc_cloud_lxc.sync_images
    to copy images) is authorised for root on the node by the operator. #}
mccloud-cn-sshkeys:
  test.nop:
    - name: the controller's ssh key is authorised on compute nodes by the operator
