"""The stages and model shared by FeDiSyn and its baselines GPT-FL, FGL, SFLF and CAFF.

    config.py          the shared config pieces (the ViT, ``lora``, ``systems``)
    model.py           State / wire key prefixes and the LoRA-wrapped ViT's backbone keys
    synthesis.py       the synthesis stage (round 0) and its sources: feature-guided, text-only
    synthesis_step.py  the server side of round 0: latents → prompts → synthetic images → pre-trained ViT
    finetune.py        the fine-tuning stage (LoRA, CLC, WFBA) and the ImageNet start of SFLF / CAFF
    planning.py        per-round system plan: profiles → contributions → depths (CLC) → bandwidth (WFBA)
    pilots.py          the pilots of ``synthetic_lambda: auto`` and their fit (λ*), for every synthesis method
    family.py          :class:`FeDiSynFamily`: the ViT, devices, evaluation and State every member shares

Each method is one file (or, for FeDiSyn, ``algorithms/fedisyn/``) declaring which of these stages it runs;
this package registers no method.
"""
