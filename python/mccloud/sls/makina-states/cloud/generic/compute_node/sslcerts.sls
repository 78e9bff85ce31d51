{#- Historical name (makina-states): the https certificates of the node,
    which makina-states.cloud.generic.compute_node.reverse_proxy writes today
    (the certificate haproxy's https frontend binds). Data: as
    reverse_proxy. #}
include:
  - makina-states.cloud.generic.compute_node.reverse_proxy
