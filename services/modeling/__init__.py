"""The model layer the retriever, the policy and the trainer share (torch and the models' text protocol):
the sentence encoder (`encoder`), the Search-R1 prompt and tag protocol (`prompt`), and retrieval as a
Plackett–Luce policy, in numpy for serving and torch for training (`plackett_luce`). `services/common`
stays torch-free; nothing here knows about HTTP, Redis or a service."""
