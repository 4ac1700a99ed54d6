
hf/models/llama1/corpus/books.jsonl/corpus/spm.model!š™™™™™©?"þÿÿÿÿÿÿÿÿ€PÀÿÿÿÿÿÿÿÿ(À„=0B/srv/out/hf