"""Load the te_verify plugin when running from a checkout (an installed package registers it as pytest11)."""
