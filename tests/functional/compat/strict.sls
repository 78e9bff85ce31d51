{#- The control: a key the registry does not hold fails the render. #}
compat-strict:
  test.show_notification:
    - text: "{{ salt['mc_cloud.settings']().no_such_key }}"
