"""The question data every part reads: the datasets and their files, the user's data files, and the split (the
first questions of each file are the evaluation split, never trained on). The evaluation and the trainer both
import it; it imports nothing of theirs."""
