"""A Tinker-compatible training API: `posttrain tinker-serve` (docs/tinker.md).

``wire`` reads and writes the SDK's protobuf messages; ``losses`` maps the SDK's loss names onto
`posttrain.algos`; ``training`` holds a base model with one LoRA adapter and optimizer per
training client; ``checkpoints`` saves and loads them under the server's root; ``app`` is the
HTTP routes and futures; ``cli`` the command. It sits beside `posttrain.serve` (whose key
check, body reader and error shape it reuses) and above `core`, `models` and `rollout`.
"""
