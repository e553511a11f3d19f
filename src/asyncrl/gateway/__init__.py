"""The gateway: the hub every other component talks to.

It runs as a native sidecar of the trainer pod, so it outlives a trainer-container restart. It proxies the
agents' model calls to the inference server (pausing and draining them around weight updates), keeps the
rollout store and the captured model-call and reward events, and holds the window summary the operator reads.
"""
