"""The TE implementations a case can run on (api: --te-impl's choice and TE's API subset), TE's own Python over the
tex emulation on CPU (tecpu), the pure-PyTorch model of TE's intended contract (reference), and FP8 format math."""
