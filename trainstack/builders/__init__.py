"""Pure builders: typed config in, plain data (manifests, AWS inputs, policies) out.

Nothing here imports Pulumi, so the CLI, the policy pack and tests use the same code.
"""
