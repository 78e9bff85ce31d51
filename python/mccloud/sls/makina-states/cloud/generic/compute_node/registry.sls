{#- The compute node's registry (see mccloud.localreg): what
    mc_cloud_compute_node.cn_settings answers on the node, in the original's
    keys. Written whole from pillar mccloud:cn_registry at every deploy and
    VM destroy, atomically (a temporary file renamed), mode 0600: it holds
    private keys. Its directory is the minion option mccloud_registry_dir. #}
{%- from "makina-states/cloud/generic/job.jinja" import job_key with context %}
mccloud-cn-registry:
  file.serialize:
    - failhard: true
    - name: {{ ((opts.get('mccloud_registry_dir') or '/etc/makina-states') ~ '/cloud_compute_node_settings.yaml') | tojson }}
    - dataset_pillar: {{ job_key }}:cn_registry
    - serializer: yaml
    - makedirs: true
    - mode: '0600'
    - show_changes: false
