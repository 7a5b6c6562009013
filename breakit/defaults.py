"""The page's default input values for one event of a running gradio app (what its page would send unchanged).

    from defaults import event_inputs
    data, deps = event_inputs(base, fn_index)
"""
import httpx


def event_inputs(base: str, fn_index: int):
    config = httpx.get(f"{base}/config", timeout=30).json()
    comps = {c["id"]: c for c in config["components"]}
    dep = next(d for d in config["dependencies"] if d["id"] == fn_index)
    data = []
    for cid in dep["inputs"]:
        comp = comps[cid]
        props = comp.get("props", {})
        value = props.get("value")
        if comp["type"] == "state":
            value = None
        data.append(value)
    labels = [f"{cid}:{comps[cid]['type']}:{comps[cid].get('props', {}).get('label')}" for cid in dep["inputs"]]
    return data, labels
