"""Pure rules and value models: job status, admission, pod sets, member health, records."""
