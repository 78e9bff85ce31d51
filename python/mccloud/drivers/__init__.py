"""The virtualisation drivers' runner bodies: :mod:`.lxc` (containers) and
:mod:`.saltify` (bare metal). Everything specific to a type lives in its
driver; the generic bodies (:mod:`mccloud.orchestration.generic`) reach it
through the driver's runner functions (``mc_cloud_<vt>.*``)."""
