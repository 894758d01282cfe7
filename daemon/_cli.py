def main():
    print("cli")
