{#- Destroy: stop and remove the VM's container. Data: pillar
    mccloud:destroy (name, lxc_path), given to the command through its
    environment. Applied in one job with the node's reverse proxy, hosts
    and firewall (pillar mccloud: the node's settings without the VM). #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set d = job.destroy %}
mccloud-lxc-vm-destroy:
  cmd.run:
    - failhard: true
    - stateful: true
    - name: |
        if [ ! -e "$MCCLOUD_LXC_PATH/$MCCLOUD_NAME/config" ]; then
            echo "changed=no comment='no container $MCCLOUD_NAME'"; exit 0
        fi
        lxc-stop -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_NAME" -k >/dev/null 2>&1
        lxc-destroy -P "$MCCLOUD_LXC_PATH" -n "$MCCLOUD_NAME" || exit $?
        echo "changed=yes comment='container $MCCLOUD_NAME destroyed'"
    - env:
        MCCLOUD_LXC_PATH: {{ d.lxc_path | string | tojson }}
        MCCLOUD_NAME: {{ d.name | string | tojson }}
