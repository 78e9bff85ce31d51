{#- The nightly image synchronisation on the controller: a root cron entry
    running mc_cloud_lxc.sync_images (every lxc compute node) at cron_minute
    and cron_hour of mc_cloud_images.settings()['lxc']; the entry is removed
    when cron_sync is false. The command is fixed text: the mastersalt flag
    only picks the configuration directory. The schedule is written only
    when both values are plain cron fields (a line break would add a
    crontab line). The identifier is the one makina-states gave its entry,
    so a migrated controller's entry is replaced, not doubled.
    Data: pillar mccloud:image_sync (cron_sync, cron_minute, cron_hour,
    mastersalt). #}
{%- from "makina-states/cloud/generic/job.jinja" import job with context %}
{%- set s = job.image_sync %}
{%- set command = 'salt-run -c ' ~ ('/etc/mastersalt' if s.mastersalt else '/etc/salt')
                  ~ ' -l warning mc_cloud_lxc.sync_images >/dev/null' %}
{%- set identifier = 'ms lxc image synchronniser' %}
{%- if s.cron_sync %}
{%- set minute, hour = s.cron_minute | string, s.cron_hour | string %}
{%- set field = '([0-9*/,-]{1,64})\\Z' %}
{%- set plain = (minute | regex_match(field)) and (hour | regex_match(field)) and true or false %}
mccloud-lxc-image-sync-schedule:
  test.configurable_test_state:
    - failhard: true
    - name: the image sync schedule is made of cron fields
    - changes: false
    - result: {{ plain }}
    - allow_test_mode_failure: true
    - comment: {{ (('minute ' ~ minute ~ ', hour ' ~ hour) if plain else
                   ('not installing the image sync cron entry: cron_minute (' ~ minute ~ ') and cron_hour ('
                    ~ hour ~ ') of makina-states.cloud.images.lxc must be cron fields (digits, *, /, - and ,)'))
                  | tojson }}

mccloud-lxc-image-sync-cron-pkg:
  pkg.installed:
    - failhard: true
    - name: cron

mccloud-lxc-image-sync-cron:
  cron.present:
    - failhard: true
    - name: {{ command | tojson }}
    - identifier: {{ identifier | tojson }}
    - user: root
    - minute: {{ (minute if plain else '0') | tojson }}
    - hour: {{ (hour if plain else '0') | tojson }}
    - require:
      - test: mccloud-lxc-image-sync-schedule
      - pkg: mccloud-lxc-image-sync-cron-pkg
{%- elif salt['cmd.which']('crontab') %}
mccloud-lxc-image-sync-cron:
  cron.absent:
    - failhard: true
    - name: {{ command | tojson }}
    - identifier: {{ identifier | tojson }}
    - user: root
{%- else %}
mccloud-lxc-image-sync-cron:
  test.succeed_without_changes:
    - name: image sync is off and this host has no crontab, so no entry to remove
{%- endif %}
