{#- The kvm host grains, and mccloud_kvm_accel: kvm when this node's
    /dev/kvm opens and answers the KVM API, else tcg (software emulation:
    what accel kvm:tcg falls back to). #}
{%- for grain in ['makina-states.cloud.is.compute_node', 'makina-states.cloud.is.kvmhost',
                  'makina-states.services.virt.kvm'] %}
mccloud-kvm-grain-{{ grain }}:
  grains.present:
    - failhard: true
    - name: {{ grain }}
    - value: true
{%- endfor %}

mccloud-kvm-grain-accel:
  grains.present:
    - failhard: true
    - name: mccloud_kvm_accel
    - value: {{ salt['mc_cloud_kvm.accel']() | tojson }}
