"""`evalkit probe`: contexts cut from recorded trajectories, asked of live models, each answer
classified by `proxy.guard` (DESIGN §10). One call per context: the cheap way to measure a real
model's tool-calling damage.

    contexts.py   results files → contexts (system prompt, conversation so far, tools, recorded turn)
    asking.py     targets, answers, the journal, the bounded and retried async asking
    figures.py    per-channel rates, agreement, comparisons, repair success (the one computation)
    render.py     tables (terminal, Markdown, HTML) and the plot
    run.py        a probe run on disk: options, journal, output document
    command.py    the `evalkit probe` command
"""
