"""An nsbox guest's service: answers every TCP connection on port 22 with
an SSH-like banner naming the guest, then closes it. Runs inside the
guest's network namespace."""

import os
import socket

banner = f"SSH-2.0-nsbox {os.environ['NSBOX_NAME']}\r\n".encode()
with socket.create_server(("0.0.0.0", 22), reuse_port=False) as srv:
    while True:
        conn, _ = srv.accept()
        with conn:
            conn.sendall(banner)
