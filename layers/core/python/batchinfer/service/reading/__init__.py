"""Reading a batch: its results in submission order (`results`), in the order they finished and filtered
(`finished_order`, with long polls), an account's batches and files a page at a time (`listing`), and a
batch's analytics (`analytics`).

Reads only, but for the long-poll holds (`..limits`) a waiting read takes and gives back.
"""
