"""One case in a lane: the process put in the state a case starts from (isolation, process_state), the training
iterations on a backend under the probes (runner; the TE lane's microbatches: microbatch), and the checks a lane
applies to the records (caserun, te_case)."""
