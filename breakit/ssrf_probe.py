"""Does any front of a public kvlab send a request to a URL a visitor types? Listens on a local port and
names it as an `engine:openai` base_url in every API that takes strategies; prints each reply's first line
and every connection the listener saw.

    python breakit/ssrf_probe.py BASE PORT
"""
import socket
import sys
import threading
import time

from gradio_client import Client

BASE, PORT = sys.argv[1], int(sys.argv[2])
seen = []


def listen():
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", PORT))
    server.listen(16)
    while True:
        conn, _ = server.accept()
        seen.append(conn.recv(200))
        conn.close()


threading.Thread(target=listen, daemon=True).start()
URL = f"engine:openai:base_url=http://127.0.0.1:{PORT}/v1:metrics=true"
client = Client(BASE, verbose=False)
calls = [("/compare_strategies", (f"dynamic,{URL}", "hi", 2, "bundled", False)),
         ("/needle", (f"dynamic,{URL}", "512", "0", "0", 1, "bundled")),
         ("/diverge", (URL, "hi", 1, "dynamic", "bundled")),
         ("/plan_memory", ("bundled", "1k", f"dynamic,{URL}", 1, "float32", 0))]
for api, args in calls:
    try:
        reply = str(client.predict(*args, api_name=api))
        at = reply.find("KVLAB_ALLOW_ENDPOINTS")
        print(api, "OK", reply[max(0, at - 80):at + 40] if at >= 0 else reply[:200], flush=True)
    except Exception as err:  # noqa: BLE001
        print(api, "ERR", str(err)[:200], flush=True)
time.sleep(1)
print("connections seen:", len(seen), [s[:60] for s in seen])
