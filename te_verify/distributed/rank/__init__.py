"""What runs inside a rank for one case: the case runner, what each collective carried (carried), the collective
counter and the reshard timeline (observe), and the training engines' step and trajectory (training)."""
