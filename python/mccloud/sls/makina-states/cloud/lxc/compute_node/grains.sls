{%- for grain in ['makina-states.cloud.is.compute_node', 'makina-states.cloud.is.lxchost',
                  'makina-states.services.virt.lxc'] %}
mccloud-lxc-grain-{{ grain }}:
  grains.present:
    - failhard: true
    - name: {{ grain }}
    - value: true
{%- endfor %}
