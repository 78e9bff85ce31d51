{#- The compute node's registry (see mccloud.localreg): what
    mc_cloud_compute_node.cn_settings answers on the node, in the original's
    keys. Written whole from pillar mccloud:cn_registry_json (the registry
    as one JSON text, made by the runner) at every deploy and
    VM destroy, atomically (a temporary file renamed), mode 0600: it holds
    private keys. Its directory is the minion option mccloud_registry_dir.
    It is JSON, which every YAML reader reads (the file keeps its
    historical name): Salt's YAML serializer took seconds for a node of a
    thousand VMs. ASCII only: YAML readers take U+0085, U+2028 and U+2029
    in a string for line breaks, so they are written escaped. #}
{%- from "makina-states/cloud/generic/job.jinja" import job_key with context %}
mccloud-cn-registry:
  file.managed:
    - failhard: true
    - name: {{ ((opts.get('mccloud_registry_dir') or '/etc/makina-states') ~ '/cloud_compute_node_settings.yaml') | tojson }}
    - contents_pillar: {{ job_key }}:cn_registry_json
    - makedirs: true
    - mode: '0600'
    - show_changes: false
