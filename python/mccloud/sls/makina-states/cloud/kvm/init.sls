{#- The kvm cloud part: registers itself as active (the grain below) and
    includes the generic part, as makina-states.cloud.lxc does. The kvm
    controller side is applied by mc_cloud_kvm.post_deploy_controller
    (makina-states.cloud.kvm.controller.post_deploy). #}
include:
  - makina-states.cloud.generic

mccloud-cloud-kvm-active:
  grains.present:
    - name: makina-states.cloud.kvm
    - value: true
